"""Raw values -> ids and values, fitted once (DESIGN §7, the lowest data floor): the feature spec, the
per-column value rules, encoding, vocabularies, multi-hot and the persistence of a fitted pipeline.
"""
