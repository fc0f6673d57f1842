"""A module with no stages."""

VALUE = 1
