-- The regions' totals add up to the customers' (rows returned = failures).
select r.total, c.total
  from (select sum(total) as total from {{ ref('region_totals') }}) r,
       (select sum(total) as total from {{ ref('customer_totals') }}) c
 where r.total is distinct from c.total
