"""Compute kernels. Each `<op>.py` holds `<op>_ref()` (plain fp32 torch, the oracle), the Triton
kernel, and a wrapper that checks shapes and launches it."""
