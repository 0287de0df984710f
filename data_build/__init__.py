"""Builders that turn raw source files (FEVER, SciFact, PersonaMem) into the Instance dataset."""
