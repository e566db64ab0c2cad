"""Helpers shared by test modules in more than one folder (plain functions; fixtures live in
``conftest.py`` files). ``tests/test_layers.py`` checks that each helper is defined once."""
