"""Partial-match management under a memory budget: TPM and STPM (001_e24f905c15fdf08b.txt, section 5)."""
