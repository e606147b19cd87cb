"""DeepSeek-V4.1 building blocks, one file per block, plain fp32 PyTorch (the reference math)."""
