# vramlab report: gnuplot batch.gp in this folder re-renders batch.png
if (!exists("vl_png")) vl_png = 'batch.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Peak memory vs batch (rung after, planned at 512x512)'
set xlabel 'micro-batch'
set ylabel 'GB'
set grid
set key left top
plot 'batch.dat' using 1:2 with points pt 7 ps 1.2 title 'planned peak', 1.01764 + 0.252855*x with lines lw 2 dt 2 title 'fit: 1.02 GB + 0.253 GB x batch (R^2 1.00000)', 21.9043 with lines lw 2 lc rgb 'red' title 'cap'
