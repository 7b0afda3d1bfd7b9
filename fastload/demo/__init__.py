"""Real photographs for the demo, the benchmarks and the tests: scikit-image's bundled photos
(:mod:`.photos`) cut into JPEG datasets of any size (:mod:`.data`)."""
