{#-
  Helpers of the stream_table materialization. Quoting is done here rather than with dbt's
  relation rendering, which does not escape a double quote inside an identifier.
-#}

{# A PostgreSQL identifier, always quoted, embedded double quotes doubled. #}
{% macro ident(name) -%}
  {{- '"' ~ (name | string).replace('"', '""') ~ '"' -}}
{%- endmacro %}

{# A PostgreSQL string literal that means the same whatever standard_conforming_strings is. #}
{% macro literal(value) -%}
  {%- if value is none -%}NULL
  {%- else -%}E'{{ (value | string).replace('\\', '\\\\').replace("'", "''") }}'
  {%- endif -%}
{%- endmacro %}

{# The stream table's name as pgtrickle's functions take it: 'schema.name' in SQL syntax, as a literal. #}
{% macro st_name(relation) -%}
  {{- pgtrickle.literal(pgtrickle.ident(relation.schema) ~ '.' ~ pgtrickle.ident(relation.identifier)) -}}
{%- endmacro %}

{#
  The options of alter_stream_table that a model may set, with their SQL types. schedule and
  refresh_mode are declarative (a model that does not set them gets the defaults); the others,
  when not set, are left as they are.
#}
{% macro alter_option_types() -%}
  {{ return({
      'schedule': 'text',
      'refresh_mode': 'text',
      'circuit_breaker': 'text',
      'circuit_breaker_ceiling': 'bigint',
      'circuit_breaker_max_ratio': 'double precision',
      'circuit_breaker_sensitivity': 'double precision',
      'circuit_breaker_window': 'integer',
      'circuit_breaker_baseline': 'text',
      'differential_fallback_ratio': 'double precision',
      'watermark_gating': 'text',
      'diamond_consistency': 'text',
  }) }}
{%- endmacro %}

{# `name => 'value'::type` for each option the model sets (schedule and refresh_mode always). #}
{% macro option_args(options) -%}
  {%- set types = pgtrickle.alter_option_types() -%}
  {%- set args = [] -%}
  {%- for key, type in types.items() if options.get(key) is not none -%}
    {%- do args.append(key ~ ' => ' ~ pgtrickle.literal(options[key]) ~ '::' ~ type) -%}
  {%- endfor -%}
  {{- args | join(', ') -}}
{%- endmacro %}

{# The model's options: its config, with schedule and refresh_mode defaulted like create_stream_table's. #}
{% macro model_options() -%}
  {%- set options = {} -%}
  {%- for key in pgtrickle.alter_option_types() -%}
    {%- do options.update({key: config.get(key)}) -%}
  {%- endfor -%}
  {%- if options['refresh_mode'] is none -%}
    {%- do options.update({'refresh_mode': 'AUTO'}) -%}
  {%- endif -%}
  {%- if options['schedule'] is none -%}
    {%- set row = run_query("select value from pgtrickle.pgt_settings where name = 'default_schedule'") -%}
    {%- do options.update({'schedule': row.columns[0].values()[0] if row | length else '1m'}) -%}
  {%- endif -%}
  {{ return(options) }}
{%- endmacro %}

{# The name as PostgreSQL (and pgtrickle's messages) show it: quoted only where needed. #}
{% macro display_name(relation) -%}
  {%- set rows = run_query("select pg_catalog.format('%I.%I', " ~ pgtrickle.literal(relation.schema) ~ ", "
                           ~ pgtrickle.literal(relation.identifier) ~ ")") -%}
  {{ return(rows.columns[0].values()[0]) }}
{%- endmacro %}

{# What is at the model's name now: nothing, a stream table, or another relation. #}
{% macro existing(relation) -%}
  {%- set installed = run_query(
      "select pg_catalog.to_regprocedure('pgtrickle.stream_table_query_changed(text, text)') is not null") -%}
  {%- if not installed.columns[0].values()[0] -%}
    {{ exceptions.raise_compiler_error(
        "pgtrickle is not installed in database " ~ relation.database ~ ", or its SQL API is older than this "
        ~ "dbt package: run `pgtrickle install` against it (it installs and upgrades in place)") }}
  {%- endif -%}
  {%- set rows = run_query(
      "select c.oid::bigint, c.relkind::text, s.pgt_id is not null"
      ~ " from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace"
      ~ " left join pgtrickle.pgt_stream_tables s on s.pgt_relid = c.oid"
      ~ " where n.nspname = " ~ pgtrickle.literal(relation.schema)
      ~ " and c.relname = " ~ pgtrickle.literal(relation.identifier)) -%}
  {%- if rows | length == 0 -%}
    {{ return({'kind': none}) }}
  {%- endif -%}
  {%- set row = rows.rows[0] -%}
  {{ return({'kind': 'stream_table' if row[2] else 'other', 'oid': row[0], 'relkind': row[1]}) }}
{%- endmacro %}

{# The stream tables that would go with this one (cascade), by display name. #}
{% macro dependents(oid) -%}
  {%- set rows = run_query(
      "with recursive down(relid) as (select " ~ oid ~ "::oid"
      ~ " union select s.pgt_relid from down join pgtrickle.pgt_dependencies d on d.source_relid = down.relid"
      ~ " join pgtrickle.pgt_stream_tables s on s.pgt_id = d.pgt_id)"
      ~ " select pg_catalog.format('%I.%I', s.pgt_schema, s.pgt_name) from pgtrickle.pgt_stream_tables s"
      ~ " where s.pgt_relid in (select relid from down) and s.pgt_relid <> " ~ oid ~ "::oid"
      ~ " order by s.pgt_id") -%}
  {{ return(rows.columns[0].values() | list) }}
{%- endmacro %}

{# The options as the catalog holds them, keyed by alter_stream_table's names. #}
{% macro catalog_options(relation) -%}
  {%- set rows = run_query(
      "select schedule, refresh_mode, cb_mode, cb_ceiling::text, cb_max_ratio::text, cb_sensitivity::text,"
      ~ " cb_window::text, cb_baseline, diff_fallback_ratio::text, watermark_gating, diamond_consistency"
      ~ " from pgtrickle.pgt_stream_tables where pgt_schema = " ~ pgtrickle.literal(relation.schema)
      ~ " and pgt_name = " ~ pgtrickle.literal(relation.identifier)) -%}
  {%- set row = rows.rows[0] -%}
  {%- set keys = pgtrickle.alter_option_types().keys() | list -%}
  {%- set result = {} -%}
  {%- for i in range(keys | length) -%}
    {%- do result.update({keys[i]: row[i]}) -%}
  {%- endfor -%}
  {{ return(result) }}
{%- endmacro %}
