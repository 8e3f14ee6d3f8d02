"""What the job is, decided once: the user's config, the neutral job spec, and the plan that joins them."""
