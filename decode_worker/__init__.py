"""dsflash.decode_worker"""
