"""The renderer of bench/RESULTS.md and README.md: its shared parts (`core`) and one module per section's data."""
