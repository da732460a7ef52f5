"""The replay buffer: a ring of segments that stores every frame once, described by one table of fields."""
