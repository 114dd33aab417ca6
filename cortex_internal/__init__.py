"""Cortex's module names, kept so that predictors written for Cortex import unchanged."""
