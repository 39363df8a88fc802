-- Built on another stream table: the ref() is a dependency in pgtrickle's DAG, so a refresh of
-- region_totals follows customer_totals'. 'calculated': as often as what reads it needs, else the default.
{{ config(materialized='stream_table', schedule='calculated') }}

select region,
       count(*) as customers,
       sum(orders) as orders,
       sum(total) as total
  from {{ ref('customer_totals') }}
 group by region
