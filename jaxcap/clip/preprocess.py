"""CLIP's image preprocessing on the host, as ``clip.clip._transform(n_px)`` (and clipscore's and
pacscore's copies of it) computes it on a PIL image: the shorter side resized to ``n_px`` with
PIL's bicubic filter (the longer side ``int(n_px * long / short)``: torchvision's
``Resize(n_px)``), a centred ``n_px`` square cut (offsets ``int(round((size - n_px) / 2))``:
``CenterCrop``), converted to RGB. The result is uint8 ``[n_px, n_px, 3]``; ``ToTensor`` and
``Normalize`` (``x / 255``, CLIP's mean and std) happen in the image tower
(:class:`jaxcap.clip.model.ImageTower`), on the device.
"""

from __future__ import annotations

import numpy as np

from jaxcap.errors import BadInput


def preprocess(img, n_px: int = 224) -> np.ndarray:
  """uint8 ``[n_px, n_px, 3]`` from a PIL image."""
  from PIL import Image
  w, h = img.size
  short, long = (w, h) if w <= h else (h, w)
  new_short, new_long = n_px, int(n_px * long / short)
  new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
  img = img.resize((new_w, new_h), Image.BICUBIC)
  top, left = int(round((new_h - n_px) / 2.0)), int(round((new_w - n_px) / 2.0))
  img = img.crop((left, top, left + n_px, top + n_px)).convert("RGB")
  return np.asarray(img, np.uint8)


def load_image(path: str, n_px: int = 224) -> np.ndarray:
  """:func:`preprocess` of the image file ``path``; one line naming it when it is not one."""
  from PIL import Image, UnidentifiedImageError
  try:
    with Image.open(path) as img:
      return preprocess(img, n_px)
  except FileNotFoundError:
    raise BadInput(f"{path}: no such image file") from None
  except (UnidentifiedImageError, OSError, ValueError) as e:
    from jaxcap.features.extract import IMAGE_EXTENSIONS  # the kinds a --clip_images folder finds
    raise BadInput(f"{path}: not an image PIL reads ({type(e).__name__}); expected an image file "
                     f"({' '.join(IMAGE_EXTENSIONS)})") from None
