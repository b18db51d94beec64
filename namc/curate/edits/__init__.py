"""Edit-pair engines: corpora of image pairs whose second image is *made* from the first, so the change is known.

- Img-Diff (``002``): object replacement with Prompt-to-Prompt pairs, the Difference Area Generator, the Difference
  Captions Generator, object removal by inpainting (``namc curate replace | regions | region-captions | remove``);
- MED (``004``): controlled micro-edits in eleven categories and their multiple-choice questions
  (``namc curate edit | questions``).

:mod:`namc.curate.edits.base` is the contract with the image models; :mod:`namc.curate.edits.backends` builds them.
"""
