"""DeepSpeed training: distributed init, engine + optimizer step, SFT loop, checkpoints."""
