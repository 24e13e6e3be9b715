"""Alembic environment: the URL comes from the caller (`toolfence migrate`)."""

from __future__ import annotations

from alembic import context

from executor.store.engine import make_engine
from executor.store.schema import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url")
assert url, "toolfence migrate sets sqlalchemy.url"

if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            version_table="toolfence_alembic_version",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
