"""The m2 configs: ``--config configs/m2.py:<arg>`` finds them (jaxcap.config_files). They
import the shared helpers as ``from jaxcap import config_common as common``."""
