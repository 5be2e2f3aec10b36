"""The `core` dialect, part 3: reductions and softmax."""
