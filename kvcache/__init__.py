"""dsflash.kvcache"""
