"""What the prefill and decode workers share: the engine thread, registration, health, drain."""
