"""OpenAI CLIP in linen and the CLIP-based caption scores.

- :mod:`jaxcap.clip.model`: the ViT image tower and the text tower (``encode_image`` /
  ``encode_text``), equal to openai/CLIP's, open_clip's and Hugging Face's on their weights;
- :mod:`jaxcap.clip.tokenizer`: ``clip.tokenize``'s byte-pair tokenizer;
- :mod:`jaxcap.clip.preprocess`: its resize, crop and RGB conversion (the normalisation is on the
  device);
- :mod:`jaxcap.clip.weights`: the weights files users have, read without torch, and random
  stand-ins for trials (``python -m jaxcap.clip.weights --random --out ...``);
- :mod:`jaxcap.clip.score`: CLIP-S, RefCLIP-S (two readings), PAC-S and RefPAC-S.
"""
