"""Sweeps: bwopt's Hydra launcher (a fresh process per job), the sweep's MLflow parent run, the report."""
