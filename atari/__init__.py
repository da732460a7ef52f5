"""Environment construction, preprocessing and vectorization for acer_sync."""
