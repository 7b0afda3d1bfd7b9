"""The Loader's own parts: its passes and epochs (:mod:`.passes`, :mod:`.progress`), what
``on_error="skip"`` replaced (:mod:`.skips`), DataLoader's keywords and attributes
(:mod:`.compat`) and the tuner's saved profiles (:mod:`.profiles`)."""
