"""dsflash.prefill_worker"""
