"""Helpers shared by test modules (executors, trace builders); no tests live here."""
