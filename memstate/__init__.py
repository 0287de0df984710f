"""memstate core: schema, prompts, reasoning-state rules, responder, tiny models, CLI."""
