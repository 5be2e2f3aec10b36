"""The reference target: the numpy reference interpreter as a target (target.py)."""
