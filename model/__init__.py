"""DeepSeek-V4.1-Flash: config, checkpoint formats, the reference forward pass, DSpark."""
