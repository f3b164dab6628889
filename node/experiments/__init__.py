"""Experiments: sweeps of local swarms (SAPO's sharing table), their results, tables and plots."""
