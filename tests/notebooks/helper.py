"""Import ``notebooks/sweep_report.py`` (the notebooks' helper, not a package module) for the tests."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def import_sweep_report():
    """The ``sweep_report`` module of ``notebooks/``, imported without leaving that folder on ``sys.path``."""
    sys.path.insert(0, str(REPO / "notebooks"))
    try:
        import sweep_report
    finally:
        sys.path.remove(str(REPO / "notebooks"))
    return sweep_report
