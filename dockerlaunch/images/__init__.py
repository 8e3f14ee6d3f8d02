"""Pinned training images: the stack matrix, compatibility rules, build, fetch and verify."""
