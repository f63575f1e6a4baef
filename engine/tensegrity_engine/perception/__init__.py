"""Perception: rod poses from depth images (differentiable capsule rendering, tracking)."""
