# For tools that still call setup.py: everything is in pyproject.toml (docs/dependencies.md).
__import__("setuptools").setup()
