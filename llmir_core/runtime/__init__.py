"""Running models: tensors in/out, decoders, generation, sampling, benchmarks."""
