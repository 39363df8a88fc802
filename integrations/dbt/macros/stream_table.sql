{#-
  materialized='stream_table': the model is a pgtrickle stream table, kept fresh by the pgtrickle
  daemon. On `dbt run`:
    * no relation of that name: pgtrickle.create_stream_table;
    * a stream table with the same defining query (compared normalized, by PostgreSQL):
      pgtrickle.alter_stream_table with the model's options (the log says what changed);
    * a stream table whose query changed, or --full-refresh: dropped (with the stream tables
      built on it, which their own models recreate) and created again, and the log says so;
    * a relation that is not a stream table (the model was a table or view before): dropped,
      as dbt does when a model changes materialization, and the stream table created.
  Everything runs in one transaction: an error (pgtrickle's, naming the problem) changes nothing.
  ref()s to other stream-table models are read by the query, so pgtrickle records them as
  dependencies and refreshes in that order.
-#}

{% materialization stream_table, adapter='postgres' %}
  {%- set target_relation = this.incorporate(type='table') -%}
  {%- set name = pgtrickle.st_name(this) -%}
  {%- set grant_config = config.get('grants') -%}
  {%- set initialize = config.get('initialize', true) -%}

  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}

  {%- set options = pgtrickle.model_options() -%}
  {%- set existing = pgtrickle.existing(this) -%}
  {%- set display = pgtrickle.display_name(this) -%}
  {%- set create_sql -%}
    select pgtrickle.create_stream_table({{ name }}, {{ pgtrickle.literal(sql) }},
        schedule => {{ pgtrickle.literal(options.schedule) }}, refresh_mode => {{ pgtrickle.literal(options.refresh_mode) }},
        initialize => {{ pgtrickle.literal(initialize) }}::boolean);
    {%- set more = options.copy() -%}
    {%- do more.update({'schedule': none, 'refresh_mode': none}) -%}
    {%- if pgtrickle.option_args(more) %}
    select pgtrickle.alter_stream_table({{ name }}, {{ pgtrickle.option_args(more) }})
    {%- endif -%}
  {%- endset -%}
  {%- set action = 'create' -%}
  {%- set prelude = [] -%}

  {%- if existing.kind == 'other' -%}
    {%- set kinds = {'r': 'table', 'p': 'table', 'v': 'view', 'm': 'materialized view', 'f': 'foreign table'} -%}
    {%- set kind = kinds.get(existing.relkind) -%}
    {%- if kind is none -%}
      {{ exceptions.raise_compiler_error(display ~ " exists and is not a table or view (relkind "
                                         ~ existing.relkind ~ "): drop it before making the model a stream table") }}
    {%- endif -%}
    {{ log("pgtrickle: replacing " ~ kind ~ " " ~ display ~ ", which is not a stream table, with a stream table", info=True) }}
    {%- do prelude.append("drop " ~ kind ~ " " ~ display ~ " cascade") -%}
  {%- elif existing.kind == 'stream_table' -%}
    {%- set changed_rows = run_query("select pgtrickle.stream_table_query_changed(" ~ name ~ ", "
                                     ~ pgtrickle.literal(sql) ~ ")") -%}
    {%- set query_changed = changed_rows.columns[0].values()[0] -%}
    {%- if should_full_refresh() or query_changed -%}
      {%- set why = 'full refresh' if should_full_refresh() else 'its defining query changed' -%}
      {%- set dependents = pgtrickle.dependents(existing.oid) -%}
      {{ log("pgtrickle: replacing stream table " ~ display ~ " (" ~ why ~ "): dropped and created again", info=True) }}
      {%- if dependents -%}
        {{ log("pgtrickle: dropping the stream tables built on " ~ display ~ " with it: " ~ dependents | join(', ')
               ~ " (their models create them again; select them too, e.g. dbt run -s " ~ model.name ~ "+)", info=True) }}
      {%- endif -%}
      {%- do prelude.append("select pgtrickle.drop_stream_table(" ~ name ~ ", cascade => true)") -%}
      {%- set action = 'replace' -%}
    {%- else -%}
      {%- set action = 'alter' -%}
    {%- endif -%}
  {%- endif -%}

  {%- if action == 'alter' -%}
    {%- set before = pgtrickle.catalog_options(this) -%}
    {% call statement('main') -%}
      select pgtrickle.alter_stream_table({{ name }}, {{ pgtrickle.option_args(options) }})
    {%- endcall %}
    {%- set after = pgtrickle.catalog_options(this) -%}
    {%- set changes = [] -%}
    {%- for key in after if before[key] != after[key] -%}
      {%- do changes.append(key ~ ": " ~ before[key] ~ " -> " ~ after[key]) -%}
    {%- endfor -%}
    {%- if changes -%}
      {{ log("pgtrickle: altered stream table " ~ display ~ " (" ~ changes | join(', ') ~ ")", info=True) }}
    {%- else -%}
      {{ log("pgtrickle: stream table " ~ display ~ " is up to date (same query, same options)", info=True) }}
    {%- endif -%}
  {%- else -%}
    {% call statement('main') -%}
      {% for stmt in prelude %}{{ stmt }};
      {% endfor %}{{ create_sql }}
    {%- endcall %}
    {%- if action == 'create' -%}
      {{ log("pgtrickle: created stream table " ~ display, info=True) }}
    {%- endif -%}
  {%- endif -%}

  {% do apply_grants(target_relation, grant_config, should_revoke=(action == 'alter')) %}

  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {{ adapter.commit() }}
  {{ run_hooks(post_hooks, inside_transaction=False) }}

  {{ return({'relations': [target_relation]}) }}
{% endmaterialization %}
