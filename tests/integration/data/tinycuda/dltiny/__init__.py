"""The tiny compiled package of the wheel-cache tests."""
