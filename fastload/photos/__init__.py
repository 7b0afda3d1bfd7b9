"""Real photographs, with no other fastload module beneath: scikit-image's bundled photos
(:mod:`.bundled`) and JPEG datasets cut from them (:mod:`.jpegs`), for the demo, the
benchmarks, the tests and the decoder's cost calibration."""
