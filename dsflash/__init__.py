"""dsflash: disaggregated serving of DeepSeek-V4.1-Flash.

The repository's top-level folders are installed as subpackages: dsflash.model,
dsflash.kvcache, dsflash.prefill_worker, dsflash.decode_worker, dsflash.gateway.
"""

__version__ = "0.1.0"
