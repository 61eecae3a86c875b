"""Shared test helpers: raw-data writers, tiny models and tables (one home instead of imports between test modules)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # tests/fixtures
