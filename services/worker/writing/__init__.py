"""Writing an export's messages: where the reads go (``read_source``), the seq ranges read into files
(``ranges``), the files of an artifact (``files``) and the S3 object writer (``object_writer``)."""
