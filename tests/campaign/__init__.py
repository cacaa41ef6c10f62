"""A seeded fault campaign over a real checkpointing gloo job (issue 36): see _campaign."""
