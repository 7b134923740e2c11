"""Tokenizer + tiny-model builder (the embedded default), HF checkpoint save/load, SFT example encoding."""
