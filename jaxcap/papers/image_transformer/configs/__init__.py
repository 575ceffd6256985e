"""The image_transformer configs: ``--config configs/<file>.py:<arg>`` finds them (jaxcap.config_files). They
import the shared helpers as ``from jaxcap import config_common as common``."""
