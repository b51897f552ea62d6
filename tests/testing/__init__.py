"""The fixtures every test folder shares; pyproject's ``pythonpath`` puts tests/ on the import
path, so any test imports ``testing``."""
