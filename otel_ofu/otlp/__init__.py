"""OTLP on the wire, in one place: encoding and decoding (:mod:`.codec`), the DCGM join of
incoming metrics into GPU samples (:mod:`.join`), and what the ``otlp``/``otlphttp``/``file``
exporters send (:mod:`.payload`), how (:mod:`.transport`, :mod:`.exporter`) and with which
settings (:mod:`.exporter_config`). The ``otlp`` receiver decodes with :mod:`.codec` and
:mod:`.join`.
"""
