-- One row per customer: how many orders and how much. Kept fresh by pgtrickle (DIFFERENTIAL).
{{ config(materialized='stream_table', schedule='1m', refresh_mode='AUTO') }}

select o.customer_id,
       c.region,
       count(*) as orders,
       sum(o.amount) as total
  from {{ ref('orders') }} o
  join {{ ref('customers') }} c on c.customer_id = o.customer_id
 group by o.customer_id, c.region
