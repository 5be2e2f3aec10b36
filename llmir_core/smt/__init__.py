"""The SMT verifier: rule proofs (`prove`), translation validation (`tv`), differential testing
(`differential`), intervals and invariants (`intervals`).

z3 is imported only inside this package, lazily, and every solver call runs in a killable child
process (`solver.run_job`).
"""
