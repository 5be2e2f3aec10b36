"""The `core` dialect, part 2: layout, indexing and shape ops."""
