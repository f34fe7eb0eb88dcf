"""Sections of tools/probe_scenarios.py: one module each, its stories decorated with ``@scenario``."""
