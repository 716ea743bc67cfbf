"""Energy and carbon accounting (models arrive with the green-training work)."""
