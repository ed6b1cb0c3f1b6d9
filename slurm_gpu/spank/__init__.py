"""SPANK plugin: Python side."""
