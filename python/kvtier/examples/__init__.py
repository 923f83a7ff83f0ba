"""Examples that run kvtier end to end (python -m kvtier.examples.torch_engine)."""
