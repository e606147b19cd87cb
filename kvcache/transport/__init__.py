"""dsflash.kvcache.transport"""
