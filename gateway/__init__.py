"""dsflash.gateway"""
